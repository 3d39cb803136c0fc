"""Servers started by hand: finding them on a host and writing their profiles (`tunedash adopt`, docs/adopt.md).

command.py reads a command line (which server, how launched, model, port, flags typed by the catalog);
scan.py reads the processes of a host through its Host (/proc via one shell script) into AdoptableServer rows,
with the AdoptProof a later takeover re-checks; details.py adds the python to launch with, GPU memory (the
telemetry's process list), job records and versions (find_servers: the whole look);
profile_text.py writes a profile's TOML from them; takeover.py lets a lifecycle watch a server started by hand
that runs its profile and sends it its one signal, after the ask and with the proof re-read right before it.
May import app.core.hosts, app.core.flags, app.core.profiles, app.core.telemetry and app.core.server (records,
the lifecycle's hook); never a UI, the CLI or app.sim. Only takeover.Adoption.terminate signals a process.
"""
