"""Runtime: binding shapes, memory planning, compiled plans, the reference interpreter."""
