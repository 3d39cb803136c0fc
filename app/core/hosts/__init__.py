"""Where commands run: the host interface and its implementations (local, ssh)."""
