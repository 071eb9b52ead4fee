"""The job driver's side of Ray: the session (joining a cluster or starting the embedded instance), the checks
made before it starts, and a run of plain actors in Ray Train's run list."""
