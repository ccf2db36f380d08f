"""What runs beside the RPCs: the reaper, the platform breaker, long-poll wake-ups and the
runtime-instance registry."""
