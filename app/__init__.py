"""tunedash: a terminal dashboard for tuning LLM inference servers.

Rooms (docs/architecture.md): `core/` is the UI-free engine; `cli/` the headless commands; `tui/` the Textual
shell; `sim/` the simulated GPU host, reached only as a host; `connect.py` is the one piece of glue that turns a
profile's `host` into a Host (the only module outside `sim/` and the tests that imports `app.sim`).
"""
