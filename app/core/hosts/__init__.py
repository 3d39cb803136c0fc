"""Where commands run: the Host interface and its implementations (this machine, SSH).

`base` is the interface (spawn detached, run, stream, signal a proven group, files written atomically or by
compare-and-swap, liveness, HTTP base URL), `local` runs on this machine, `ssh` over one asyncssh connection per
host: `ssh_options` builds its options from the user's ssh config, `ssh_trust` opens verified connections and
`known_hosts` reads and appends host keys; `detach` is the detached launch and `procfs` reads /proc text, the
same way for both, and `lines` splits what they read into lines cut at 64 KiB; `shell_scripts` are the host-side
scripts of the proven signal, the environment reads and the checked file write. May import only the standard
library, asyncssh and app.core.data.
"""

import warnings

# cryptography 51 marks DSA deprecated, and asyncssh (2.24) names DSA types at import: without this filter every
# tunedash command, the dashboard's terminal too, starts with ten lines of CryptographyDeprecationWarning that the
# user can do nothing about. Only that warning, only as asyncssh's modules raise it; tunedash never uses DSA keys.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\.|$)")
