"""What an answer means: classification into verdicts, ``Retry-After`` and rate-limit signals,
error bodies' encodings, server-sent events, a stream's first token (or the error before it),
and whether a buffered body is whole."""
