"""``sift simulate``: a realistic workload against the store, then a summary and the store's check.

- :mod:`.workload`: the planned submissions and the synthetic results, drawn from a seed;
- :mod:`.single`, :mod:`.tally`: the single-process run (callers, runner threads that claim from the store,
  a runner that crashes half-way and restarts), its simulated clock and its tally;
- :mod:`.fairness`: each caller's waits and each host's peak of running targets;
- :mod:`.journal`, :mod:`.host`, :mod:`.coordinator`, :mod:`.cores`: ``--hosts N``, N processes on one
  store, one of them SIGKILLed part-way;
- :mod:`.verdicts`, :mod:`.hosts_verdicts`: the end checks (``check_store`` and what the run must show);
- :mod:`.summary`, :mod:`.hosts_summary`: the summaries, as JSON or for people;
- :mod:`.stores`: which store a simulation may use, so it never changes one holding jobs it did not make.
"""
