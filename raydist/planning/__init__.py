"""`raydist plan`: the step-time cost model's shared part and its command."""
