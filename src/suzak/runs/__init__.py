"""What a training run writes beside its checkpoints: the CSV streams, checkpoint completion markers, the run record
(recipe as run, run info), the plots (``suzak plot``) and the held-out generation evaluation."""
