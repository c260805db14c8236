"""The shared layer of the methods whose clients train their rows of a global
item table with local SGD (PFedRec, FedMF, FedNCF, FedRAS and its
baselines, APFR-GKD): the client work and process (`client_training`), the
round driver and scoring (`item_method`, `item_scoring`), the local SGD
step (`local_sgd`) and how the table travels (`exchanges`)."""
