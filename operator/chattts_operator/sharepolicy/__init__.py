"""The GPUSharePolicy feature, read top-down: windows.py (time -> shares), planner.py
(policy, members, nodes, now -> caps, suspends, resumes), observe.py (objects -> planner
inputs), report.py (plan -> writes, status, Events), priorityclasses.py, resources.py
(nodes, selectors), then controller.py (the I/O)."""
