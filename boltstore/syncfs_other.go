//go:build !linux

package boltstore

// syncFS has no portable equivalent of Linux's syncfs(2): where the
// directory cannot be opened to be synced, its entry is as durable as the
// system makes it on its own.
func syncFS(string) error { return nil }
