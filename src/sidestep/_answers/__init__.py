"""What an answer means: classification into verdicts, rate-limit signals, error bodies'
encodings, server-sent events, and whether a buffered body is whole."""
