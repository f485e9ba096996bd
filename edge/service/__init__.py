"""The service around the frame path: the one frame loop, the Runtime it drives, metrics, sd_notify, jtop
telemetry and the JSON log."""
