package storeurl

import "testing"

func TestRedact(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"memory", "memory"},
		{"bolt:/var/lib/idem@x:y.db", "bolt:/var/lib/idem@x:y.db"},
		{"redis://u:pw@h:6379/0", "redis://u:xxxxx@h:6379/0"},
		{"redis://:pw@h", "redis://:xxxxx@h"},
		{"redis://u:p@ss@h/0", "redis://u:xxxxx@h/0"},
		{"rediss+cluster://u:pw@h1:1,h2:2?prefix=a:", "rediss+cluster://u:xxxxx@h1:1,h2:2?prefix=a:"},
		{"redis://h:6379/0?prefix=a@b:", "redis://h:6379/0?prefix=a@b:"},
		{"postgres://u@h/db?password=pw&sslmode=require", "postgres://u@h/db?password=xxxxx&sslmode=require"},
		{"postgres://u:pw@h/db?sslmode=verify-full&sslpassword=kp", "postgres://u:xxxxx@h/db?sslmode=verify-full&sslpassword=xxxxx"},
		{"postgres://u@h/db?pass%77ord=pw", "postgres://u@h/db?pass%77ord=xxxxx"},
		{"http://app:9000/api?x=1", "http://app:9000/api?x=1"},
	} {
		if got := Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
}
