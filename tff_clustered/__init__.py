"""tff-clustered: clustered and personalized federated learning on TensorFlow Federated.

See README.md; the algorithms are in `tff_clustered.algorithms`, the federated core in
`tff_clustered.federated`."""
