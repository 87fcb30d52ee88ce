"""Reason texts of the preemption plugin that tests compare against (the plugin has no REASON_* constants
yet; keep the copies here, in one place)."""

NO_VICTIM = "no job that may be preempted for it holds what it needs"
