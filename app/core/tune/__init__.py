"""Tuning: a [tune] space raced over request shapes with launches as the unit (docs/architecture.md#tuning).

`space` turns a profile's [tune] table into candidates (exclusions applied, what the installed server rejects
dropped with why), `race` is the racing rule (which candidates leave, where the next launches go), `run` the
runner that relaunches through the server's owner and measures every shape per launch, stored as it goes and
resumable, `results` the leaderboards, the best single config and the Pareto fronts, `export` their MD/CSV/JSON/
SVG. May import app.core.measure, server, advisor, profiles, flags, data; never the UI.
"""
