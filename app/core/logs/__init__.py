"""Server logs: patterns per backend and version, the parser into typed events, and summaries.

`patterns` is data (regexes and phrase tables), `parser` turns lines into PhaseEvent/DecodeStats/PrefillStats/
ServerCapacity/Notice/FatalEvent, `stats` builds the figures of the throughput and capacity lines, `summary`
folds a whole log into a startup timeline. Pure: may import app.core.data only.
"""
