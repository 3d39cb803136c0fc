"""Tuning: finding the best config per request shape by racing candidates with launches as the unit
(docs/architecture.md#tuning-the-runner-the-store-resume).

`race` is the decision rule (pure: observations in, a Decision out; no I/O; its design and error rates are in
docs/decisions.md, "Tune: the racing rule"). `space` turns a profile's [tune] table into candidates (exclusions
applied, what the installed server rejects dropped with why), `run` the runner that relaunches through the
server's owner and measures every shape per launch, stored as it goes and resumable, `results` the leaderboards,
the best single config and the Pareto fronts, `export` their MD/CSV/JSON/SVG, `slot_servers` the dashboard's other
slots' servers (a lifecycle and driver lock each). May import app.core.measure, server,
profiles, flags, data and the rooms below; never the UI, and not the advisor (a room on its line: the CLI passes
the advisor's fixes in).
"""
