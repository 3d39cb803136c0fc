"""The UI-free engine of tunedash: profiles, flags, hosts, telemetry, the server lifecycle, logs, measurement.

Never imports textual, rich, widgets, app.tui, app.cli or app.sim (import-linter contracts in pyproject.toml).
`data` holds the plain data types shared with the widgets; `session` is the one owner of a dashboard's
server (launch, kill, relaunch and A/B go through it); `errors` the one error root (TunedashError), `tasks` who
owns background tasks and listeners. docs/architecture.md has the picture.
"""
