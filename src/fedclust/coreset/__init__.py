"""Distributed PCA and distributed coreset k-means over any communication graph
(Balcan, Ehrlich & Liang, NIPS 2013; Liang, Balcan, Kanchanapally & Woodruff, NIPS 2014)."""
