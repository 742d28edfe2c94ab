# The seed's manager.py as it is; node_nums and proc_per_node (XX in the seed) are those of
# examples/job.yaml: 2 nodes x 2 training processes.
import os

from taskd.api import init_taskd_manager, start_taskd_manager

job_id = os.getenv("MINDX_TASK_ID")
node_nums = 2  # Total number of task nodes
proc_per_node = 2  # Number of training processes per node

init_taskd_manager({"job_id": job_id, "node_nums": node_nums, "proc_per_node": proc_per_node})
start_taskd_manager()
