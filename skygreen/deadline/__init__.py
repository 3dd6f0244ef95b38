"""Finish by a deadline at the least cost, switching between spot and on-demand.

The model is the one of "Can't Be Late" (Wu et al., NSDI'24, §3): a job has C hours of
compute left and R hours until its deadline; at any moment it is idle, on spot or on
on-demand; every switch *to* spot or on-demand costs a changeover delay d (provisioning,
setup and the work lost since the last checkpoint) during which time runs, nothing progresses
and the new instance is billed; on-demand is always available, spot only when the trace says.

- `policy`: what a policy sees (`Observation`), the decision rule each policy implements
  (greedy, Uniform Progress, skygreen's own), and the safety rule they all share. A decision is a
  pure function of the job and one observation, so the same objects can drive a live watcher.
- `simulate`: replays an availability trace (`skygreen.plan.replay.load_trace`) against a policy.
- `optimum`: the omniscient optimum over the same trace, a dynamic program (numpy).
"""
