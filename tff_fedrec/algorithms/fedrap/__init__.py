"""FedRAP: additive personalization (Li et al., ICLR 2024; arXiv 2301.09109).

Each user i scores item j with sigmoid(affine_i(D^(i)_j + C_j)): C the
global item table the server averages, D^(i) the user's own item table and
affine_i its own Linear(d -> 1), both never uploaded. `losses` is the loss
of one batch, `local_training` the users' local SGD, `client_state` the
store of their D^(i) rows, `process` the TFF process and `method` the
`Method` (`build_fedrap`). docs/methods/fedrap.md has the choices made.
"""
