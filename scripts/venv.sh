# Sourced by scripts/serve and scripts/test: make .venv usable, and install into it only when what it
# would install has changed since the last install that finished.
#
#   venv_ready NAME INSTALL [INPUT...]   # NAME: whose install (serve, test); INSTALL: the caller's
#                                        # function that runs its pip commands in .venv (after pip's own
#                                        # upgrade); INPUTs: what else they read (TORCH_SPEC)
#
# A .venv is made again (python -m venv --clear) when it cannot run pip: a Ctrl-C while it was made or while
# pip upgraded itself left one that every later run failed on, and so did one whose interpreter had gone
# (a pyenv version removed). With PYTHON set, a .venv of another Python version is made again too.
# A finished install leaves .venv/.installed-NAME holding a digest of its inputs (INSTALL's body, the
# INPUTs, pyproject.toml, requirements/serve.txt, the top-level packages an editable install
# maps, the Python version); a run that finds the same digest installs nothing, so a second `scripts/serve`
# needs no network. Code edits need no install: it is editable.

venv_python_version() { # "3.11", or nothing where $1 does not run
    "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2> /dev/null || true
}

venv_ready() {
    local name=$1 install=$2
    shift 2
    local python=${PYTHON:-python3} why="" have="" wanted=""
    if [ ! -e .venv ]; then
        why="new"
    elif ! .venv/bin/python -m pip --version > /dev/null 2>&1; then
        why="it cannot run pip (made or upgraded only in part, or its Python is gone)"
    else
        have=$(venv_python_version .venv/bin/python)
    fi
    # The Python to make a venv with is asked only where one is made or PYTHON names one: a working .venv
    # made by another Python than the python3 on PATH is kept.
    if [ -n "$why" ] || [ -n "${PYTHON:-}" ]; then
        wanted=$(venv_python_version "$python")
        if [ -z "$wanted" ]; then
            echo "$0: $python does not run: install Python 3.11 or later, or name one with PYTHON=" >&2
            exit 2
        fi
    fi
    if [ -z "$why" ] && [ -n "${PYTHON:-}" ] && [ "$have" != "$wanted" ]; then
        why="it is Python $have, and PYTHON=$PYTHON is $wanted"
    fi
    if [ -n "$why" ]; then
        [ "$why" = "new" ] || echo "$0: making .venv again: $why" >&2
        "$python" -m venv --clear .venv
        have=$wanted
    fi
    local stamp=.venv/.installed-$name digest
    digest=$(
        {
            declare -f "$install"
            printf '%s\n' "$@" "$have"
            cat pyproject.toml requirements/serve.txt
            ls -d ./*/__init__.py 2> /dev/null || true
        } | sha256sum | cut -d' ' -f1
    )
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
        return 0
    fi
    rm -f "$stamp"
    .venv/bin/python -m pip install -q --upgrade pip
    "$install"
    echo "$digest" > "$stamp"
}
