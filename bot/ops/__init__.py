"""What operators watch the service by: its log lines' set-up (``log``), its Prometheus
metrics (``metrics``), the evidence its readiness check reads (``recent_answer``) and
systemd's notify protocol (``systemd``). Nothing here imports the rest of ``bot``."""
