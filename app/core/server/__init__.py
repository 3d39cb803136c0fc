"""The server on a host: lifecycle state machine, kill and release, log-event -> state, job records, driver.

`lifecycle` moves a profile's server through its states, `release` kills a job's group and confirms the
GPUs free, `states` maps log events to states (used by the lifecycle and by `status`), `jobs` reads and
writes the job record on the host, `driver` records who drives a server, `status` inspects a job without
driving it. May import app.core.hosts, telemetry, logs, profiles, measure.http_probes and data.
"""
