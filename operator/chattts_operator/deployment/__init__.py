"""The ChatTTSDeployment feature, read top-down: spec.py (one effective spec, what it wants),
children.py (builders), gpu.py (the GPU codec, both directions), memory.py (the planner),
quantization.py (the AWQ Job), status.py, then controller.py (the I/O)."""
