"""JSON from files and bodies edgespec does not control (manifests, the digest memory, device profiles,
vocab files, HTTP bodies): `loads` is json.loads with nesting deeper than Python's parser takes
(about 1,000 levels) refused as a ValueError, which every reader already turns into its one-line
error or its "measured again", instead of a RecursionError that escapes them all."""
from __future__ import annotations

import json


def loads(data: str | bytes):
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
