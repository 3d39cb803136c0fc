"""tunedash: a terminal dashboard for tuning LLM inference servers."""
