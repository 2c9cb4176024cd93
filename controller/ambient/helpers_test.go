package ambient

import "k8s.io/apimachinery/pkg/api/equality"

func cmpEqual(a, b any) bool { return equality.Semantic.DeepEqual(a, b) }
