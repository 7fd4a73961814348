"""Matrix products: how many BLAS threads a product gets (blas.py), which gemm or gemv calls compute a
contraction in C (c_blas.py, c_gemm.py) or in numpy (contraction.py), the axes both agree on
(axes.py), and convolution windows as gemms (window.py, window_c.py, conv_c.py)."""
