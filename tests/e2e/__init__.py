"""End-to-end runs across processes: training, evaluation, resumption and cluster launches through the launchers,
on the built-in dataset and on datasets of one's own."""
