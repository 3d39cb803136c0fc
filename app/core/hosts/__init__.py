"""Where commands run: the Host interface and its implementations (this machine, SSH).

`base` is the interface (spawn detached, run, stream, signal a proven group, files written atomically or by
compare-and-swap, liveness, HTTP base URL), `local` runs on this machine, `ssh` over one asyncssh connection per
host: `ssh_options` builds its options from the user's ssh config, `ssh_trust` opens verified connections and
`known_hosts` reads and appends host keys; `detach` is the detached launch and `procfs` reads /proc text, the
same way for both, and `lines` splits what they read into lines cut at 64 KiB; `shell_scripts` are the host-side
scripts of the proven signal, the environment reads and the checked file write. May import only the standard
library, asyncssh and app.core.data.
"""
