# syntax=docker/dockerfile:1
# Two targets, both the serving install only (no torch, no training code):
#   docker build --target cpu -t electra-serve:cpu .     slim CPU image, default models baked in
#   docker build --target gpu -t electra-serve:gpu .     CUDA base with onnxruntime-gpu
# Run:  docker run -p 8000:8000 electra-serve:cpu      (mount your own bundles at /srv/models to replace them;
#       --stop-timeout 40: docker stop's 10 s would cut the server's 30 s graceful drain)

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04

# ---------------------------------------------------------------------------- build: wheels, CPU
FROM ${PYTHON_IMAGE} AS build-cpu
# CA certificates a build machine adds locally (Debian's /usr/local/share/ca-certificates), for a pip that
# reaches PyPI through an intercepting proxy: pass them as one PEM with --build-arg EXTRA_CA_CERTS="$(cat
# ...)". Empty by default; they stay in this build stage and never reach the final image.
ARG EXTRA_CA_CERTS=""
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/serve.txt requirements/not-in-image.txt ./requirements/
COPY app ./app
COPY options ./options
# Only app/ and options/ (its settings' declarations, standard library only) are copied, so the wheel holds
# the server alone. Versions come from requirements/serve.txt (what
# the tests ran on). What requirements/not-in-image.txt lists comes with litestar (its CLI and example
# factories) and tokenizers (the Hub client) but the server never imports it (about 60 MB with numpy's own
# tests and onnxruntime's offline tools), and pip has no use in the running image (14 MB): all are removed
# from the venv that is shipped.
RUN if [ -n "$EXTRA_CA_CERTS" ]; then \
        cat /etc/ssl/certs/ca-certificates.crt > /tmp/ca.pem && printf '%s\n' "$EXTRA_CA_CERTS" >> /tmp/ca.pem; \
        export PIP_CERT=/tmp/ca.pem; fi \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir ".[cpu]" -c requirements/serve.txt \
    && sed -e '/^#/d' -e '/^$/d' -e 's/ .*//' requirements/not-in-image.txt > /tmp/not-in-image \
    && xargs -a /tmp/not-in-image /opt/venv/bin/pip uninstall -y -q \
    && rm -rf /opt/venv/lib/python3*/site-packages/numpy/*/tests /opt/venv/lib/python3*/site-packages/numpy/tests \
              /opt/venv/lib/python3*/site-packages/onnxruntime/transformers \
              /opt/venv/lib/python3*/site-packages/onnxruntime/quantization \
    && /opt/venv/bin/pip uninstall -y -q pip setuptools \
    && /opt/venv/bin/python -P -c "import app.http.server"  # -P: the installed wheel, not /src's tree

# ---------------------------------------------------------------------------- cpu: the default image
FROM ${PYTHON_IMAGE} AS cpu
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    ELECTRA_HOST=0.0.0.0 \
    ELECTRA_PORT=8000 \
    ELECTRA_MODELS_DIR=/srv/models
RUN useradd --system --uid 10001 --no-create-home electra
COPY --from=build-cpu /opt/venv /opt/venv
COPY models /srv/models
USER 10001
EXPOSE 8000
# /ready with the server's own settings from the environment: its port, its host, its API key if one is set.
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-m", "app.healthcheck"]
CMD ["python", "-m", "app"]

# ---------------------------------------------------------------------------- gpu: CUDA + onnxruntime-gpu
FROM ${CUDA_IMAGE} AS gpu-base
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

FROM gpu-base AS build-gpu
# As in build-cpu: a proxy's CA for pip, in a stage of its own, so that the image's history does not record
# the argument (an ARG of the final stage is listed by `docker history`), and the PEM file removed.
ARG EXTRA_CA_CERTS=""
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/serve.txt requirements/not-in-image.txt ./requirements/
COPY app ./app
COPY options ./options
RUN if [ -n "$EXTRA_CA_CERTS" ]; then \
        cat /etc/ssl/certs/ca-certificates.crt > /tmp/ca.pem && printf '%s\n' "$EXTRA_CA_CERTS" >> /tmp/ca.pem; \
        export PIP_CERT=/tmp/ca.pem; fi \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir ".[gpu]" -c requirements/serve.txt \
    && sed -e '/^#/d' -e '/^$/d' -e 's/ .*//' requirements/not-in-image.txt > /tmp/not-in-image \
    && xargs -a /tmp/not-in-image /opt/venv/bin/pip uninstall -y -q \
    && /opt/venv/bin/pip uninstall -y -q pip setuptools \
    && rm -rf /src /tmp/ca.pem \
    && /opt/venv/bin/python -P -c "import app.http.server"

FROM gpu-base AS gpu
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    ELECTRA_HOST=0.0.0.0 \
    ELECTRA_PORT=8000 \
    ELECTRA_MODELS_DIR=/srv/models
RUN useradd --system --uid 10001 --no-create-home electra
COPY --from=build-gpu /opt/venv /opt/venv
COPY models /srv/models
USER 10001
WORKDIR /srv
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-m", "app.healthcheck"]
CMD ["python", "-m", "app"]
