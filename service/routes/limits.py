"""Upper bounds of the bias and relative-position parameters, shared by their routes.

They only reject nonsense early (422); the real guard is the output-size check (413), which
`TableRequest.serve` applies from the declared shapes before anything is computed.
"""

MAX_HEADS = 1 << 20
MAX_LENGTH = 1 << 24
MAX_OFFSET = 1 << 40
MAX_BUCKETS = 1 << 16
MAX_DISTANCE = 1 << 40
