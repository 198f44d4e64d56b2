"""Report building blocks shared by the experiments' report sections and the reproduction report."""
