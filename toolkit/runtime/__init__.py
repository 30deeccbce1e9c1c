"""Runtime: compiled plans, memory planning, threads and streams, bucketed inference sessions. It
asks the backend's registry for kernels and never imports them."""
