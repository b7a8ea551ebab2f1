"""Pipeline specs (`*.yaml`) and the Python their specs name: load generators and custom work."""
