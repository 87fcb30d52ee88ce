"""Round-based, heterogeneity-aware allocation (after Gavel; Narayanan et al., OSDI 2020).

lp       the allocation: max-min fairness over throughput-normalised shares of each GPU model, an LP
         solved with HiGHS (scipy's, as `scipy.optimize.linprog` runs it), over job classes
plan     a round's plan from a cluster view: who runs on which GPU model next, by how far each job's
         received time lags its target share
plugins  the order, admission and preemption plugins that realise a plan in the cycle, and the learner
         that records on which nodes each job received its service
"""
