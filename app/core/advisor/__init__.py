"""The advisor: what the running server leaves on the table, and why it is slower than a recorded run.

`evidence` gathers what the server itself reports (its /get_server_info, its job record's flags and log, the
GPU snapshot) into one `Evidence`, every field optional; `rules` is the "left on the table" table, rules as
data per backend and version range; `history` finds the best recorded run of the same model, host and
request shape and diffs its flags against the running ones; `advise` puts both sections into one `Advice`
(`advice_to_json`, `advice_text`). Core: may import the rest of app.core, never a UI, the CLI or the simulator.
"""
