package testenv

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ClusterIPService returns a ClusterIP Service named name in the default namespace with one
// port, 80, asking for clusterIP ("" lets the API server pick one).
func ClusterIPService(name, clusterIP string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: clusterIP,
			Ports:     []corev1.ServicePort{{Port: 80}},
		},
	}
}
