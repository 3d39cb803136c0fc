"""Where commands run: the Host interface and its implementations (this machine, SSH).

`base` is the interface (spawn detached, run, stream, signal a group, liveness, HTTP base URL), `local` runs on
this machine, `ssh` over one asyncssh connection per host with `ssh_trust` for host keys; `detach` is the
detached launch and `procfs` reads /proc text, the same way for both; `shell_scripts` are the host-side scripts
of the proven signal, the environment reads and the checked file write. May import only the standard library,
asyncssh and app.core.data.
"""
