"""/schema: the API reference as one self-contained HTML page, rendered on the server from the OpenAPI
document (no script, no CDN: it works on an air-gapped machine). The document itself is at
/schema/openapi.json."""

from __future__ import annotations

import html
import json
from typing import Any

import msgspec
from litestar import Request
from litestar.openapi.plugins import OpenAPIRenderPlugin

_STYLE = """body{font:15px/1.45 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}
code,pre{font:13px ui-monospace,monospace}pre{background:#f4f4f4;padding:.6rem;overflow:auto}
h2{border-top:1px solid #ccc;padding-top:1rem}.m{font-weight:bold;text-transform:uppercase}"""


class OfflineDocs(OpenAPIRenderPlugin):
    def __init__(self) -> None:
        super().__init__(path="/")

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        # Through Litestar's own encoder first: the dict still holds structs (examples) json cannot dump.
        openapi_schema = msgspec.json.decode(self.render_json(request, openapi_schema))
        info = openapi_schema.get("info", {})
        json_url = self.get_openapi_json_route(request)
        e = html.escape
        parts = [
            f"<!doctype html><meta charset=utf-8><title>{e(info.get('title', 'API'))}</title>"
            f"<style>{_STYLE}</style><h1>{e(info.get('title', ''))} {e(info.get('version', ''))}</h1>"
            f"<p>{e(info.get('description', ''))}</p>"
            f'<p>The OpenAPI document: <a href="{e(json_url)}"><code>{e(json_url)}</code></a></p>'
        ]
        for path, ops in openapi_schema.get("paths", {}).items():
            for method, op in ops.items():
                if not isinstance(op, dict) or "responses" not in op:
                    continue
                parts.append(
                    f"<h2><span class=m>{e(method)}</span> <code>{e(path)}</code></h2>"
                    f"<p>{e(op.get('summary', ''))}</p><p>{e(op.get('description', ''))}</p>"
                )
                body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
                if body.get("schema"):
                    parts.append(f"<h3>Request body</h3><pre>{e(json.dumps(body['schema'], indent=1))}</pre>")
                codes = ", ".join(
                    f"{e(code)} ({e(r.get('description', ''))})" for code, r in op["responses"].items()
                )
                parts.append(f"<p>Responses: {codes}</p>")
        schemas = openapi_schema.get("components", {}).get("schemas", {})
        parts.append("<h2>Schemas</h2>")
        for name, schema in schemas.items():
            parts.append(f"<h3 id={e(name)}>{e(name)}</h3><pre>{e(json.dumps(schema, indent=1))}</pre>")
        return "".join(parts).encode()
