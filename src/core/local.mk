# Multi-QP core (libvqp): filled in by the multi-QP core issue.
