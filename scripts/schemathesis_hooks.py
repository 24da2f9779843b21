"""schemathesis hooks of `scripts/schemathesis-test.sh` (`hooks` in scripts/schemathesis.toml).

A required parameter that every preset of a route fills (head_dim of /v1/rope/vision, num_heads of
/v1/alibi/bias...) says in its description that a request with `preset` may leave it out (`PRESET_FILLS`): a rule
across parameters that OpenAPI cannot state. The document keeps it required, so that a client generated from it
is never refused for its absence. A negative case that leaves it out beside a `preset` is then no request the server
must refuse (ST201 found /v1/rope/vision?preset=pixtral-12b served without head_dim): it is sent without the preset,
a request that leaves out a required parameter, which the server refuses. Every other query is sent as generated.
"""

from typing import Any

import schemathesis

from posenc.service.tables.preset import PRESET_FILLS


@schemathesis.hook
def map_query(ctx: Any, query: Any) -> Any:
    """`query` without `preset` where it leaves out a required parameter that the preset fills."""
    if not isinstance(query, dict) or query.get("preset") is None or ctx.operation is None:
        return query
    if any(parameter.is_required and parameter.name not in query
           and PRESET_FILLS in parameter.definition.get("description", "")
           for parameter in ctx.operation.query):
        return {name: value for name, value in query.items() if name != "preset"}
    return query
