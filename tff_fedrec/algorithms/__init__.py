"""Federated recommendation algorithms: one module per small method, one
package per paper (its math, roles, method and tests), the layer the
local-item methods share (`local_items`), the `Method` interface and the
registry."""
