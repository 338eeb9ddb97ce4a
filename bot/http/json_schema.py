"""A pydantic model's JSON Schema as an OpenAPI 3.0 schema (the dialect /openapi.json speaks).

Pydantic writes JSON Schema 2020-12; OpenAPI 3.0 takes an older subset. The
differences that the request models use are rewritten: ``null`` in ``anyOf``
becomes ``nullable``, ``const`` an ``enum`` of one, numeric
``exclusiveMinimum``/``exclusiveMaximum`` the boolean form beside
``minimum``/``maximum``, and ``$defs`` move to ``components/schemas``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

COMPONENTS_REF = "#/components/schemas/"


def openapi_schema(model: type[BaseModel]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``model``'s schema and the component schemas it refers to, in OpenAPI 3.0 terms."""
    schema = model.model_json_schema(ref_template=COMPONENTS_REF + "{model}")
    definitions = schema.pop("$defs", {})
    components = {name: _rewrite(value) for name, value in definitions.items()}
    return _rewrite(schema), components


def _rewrite(node: Any) -> Any:
    if isinstance(node, list):
        return [_rewrite(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _rewrite(value) for key, value in node.items() if key != "title"}
    for key in ("anyOf", "oneOf"):
        options = node.get(key)
        if isinstance(options, list) and {"type": "null"} in options:
            rest = [option for option in options if option != {"type": "null"}]
            node.pop(key)
            if len(rest) == 1 and "$ref" not in rest[0]:
                node.update(rest[0])
            else:
                node[key] = rest
            node["nullable"] = True
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for exclusive, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        bound = node.get(exclusive)
        if isinstance(bound, int | float) and not isinstance(bound, bool):
            node[inclusive] = bound
            node[exclusive] = True
    return node
