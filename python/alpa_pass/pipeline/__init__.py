"""Pipeline (inter-op) parallelism, by phase: ``trace`` (markers, the traced step), ``partition``
(layers, stages and submeshes, schedules), ``programs`` (stage and apply programs), ``compile``
(each program planned and compiled on its submesh), ``run`` (the executable, transfers between
submeshes and processes, the plan report). The method itself is ``alpa_pass.methods.pipeshard``.
"""
