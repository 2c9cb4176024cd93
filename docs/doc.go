// Package docs holds Canopy's design documents (the Markdown files beside
// this one). It has no code: its test checks that the documents and the
// READMEs name only paths that exist and that the README's layout table
// names every folder and package.
package docs
