"""The headless commands: `tunedash ...` parsed, dispatched and reported.

`main` holds the parser and the dispatch, `common` the exit codes, profile loading, printing and the one
mapping of core errors to exit codes, `server` the server commands (gpus, launch, status, kill, free, relaunch,
log, flags), `measure` the measuring ones (bench, ab, history, export, probe), `remote` the SSH host-key trust
command. May import app.core, app.connect and, for `ui`/`demo`, app.tui; no module here imports another's
private names, and core never imports this package.
"""
