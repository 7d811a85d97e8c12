// Package terraform is the Google Cloud deployment of the mesh: one root
// Terraform module (the *.tf files; docs/deploy.md explains every
// resource). Its Go code only checks that module: the tests parse every
// file with hashicorp/hcl/v2 and hold it to the route table, the worker
// table and the IAM rules.
//
// routes.tf.json and workers.tf.json are generated from the route table
// (functions/routes.All) and the worker table by cmd/meshgen; regenerate
// them with `go generate ./terraform` whenever either table changes
// (cmd/meshgen's tests fail until you do).
package terraform

//go:generate go run ../cmd/meshgen -out .
