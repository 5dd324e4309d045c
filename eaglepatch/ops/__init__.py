"""What eaglepatch does to a target, split as pyinfra splits it: facts read state, plans decide, a session carries a
plan out; every host call is ``eaglepatch.hosts.agent.call`` (one op of the host-side program, ``eaglepatch.hostside``).
Import each name from its module (nothing is re-exported here):

- ``target``: ``Connect`` (how to reach targets), ``target_spec`` / ``check_targets`` (each TARGET parsed once),
  ``Target`` (the open host), ``target_facts``;
- ``facts``: ``gather`` -> ``HostFacts``, ``WorkerFile``, ``file_state``, ``code_state``;
- ``plan``: ``Write``, ``Plan``, ``plan_apply``, ``plan_revert`` (pure);
- ``session``: ``Session`` (lock, unlock, execute), ``new_lock_owner``;
- ``options``, ``runtime_file``, ``lazy_engine``: the options, the runtime module as shipped, the transform's import;
- the commands, each with its rendering: ``inspection`` (show, status, diff), ``change`` (apply, revert, restart),
  ``logs`` (fetching timing logs, ``logs_of``), ``reporting`` (report); ``lifecycle``: the install's servers
  (``launch_of``), restarts and rollbacks.
"""
