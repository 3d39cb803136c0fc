"""Measurement: the streaming client, probe, bench, acceptance, /metrics, statistics, A/B, history, reports.

`client` streams one request, `probe` runs the dashboard's continuous stream, `bench` a request set at a
concurrency, `acceptance` speculative acceptance over a run, `http_probes` /health and /get_server_info and
/metrics, `metrics` the /metrics poller, `stats` intervals and verdicts, `experiment` A/B over relaunches,
`recorded` the one recorded-bench runner, `store` the SQLite history, `report` tables and exports. May import
app.core.data, profiles, flags, and (experiment) the Host type of its owner and app.core.server's events and
refusals, and app.core.server.health (`http_probes.check_health`); it reaches a server only through its owner.
"""
