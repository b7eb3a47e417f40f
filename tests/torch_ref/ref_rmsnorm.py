"""PyTorch references for RMSNorm: Hugging Face LlamaRMSNorm, written out (transformers is not needed).

Arrays per case: x, w, dy (inputs), y, rstd (forward), dx, dw (gradients of sum(y * dy)).
For bf16 cases y follows HF's dtype rule exactly (h rounded to bf16, then w * h in bf16), while
dx and dw are float32 autograd on the same bf16 values with that rounding as a straight-through
step -- the f32 arithmetic the op promises. dx_hf and dw_hf are HF's all-bf16 autograd, kept for
a loose comparison only.
"""
import torch

OP = "rmsnorm"


def llama_rmsnorm(x, w, eps):
    # transformers.models.llama.modeling_llama.LlamaRMSNorm.forward
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return w * h.to(input_dtype)


def rstd_of(x, eps):
    h = x.detach().to(torch.float32)
    return torch.rsqrt(h.pow(2).mean(-1) + eps)


def grads_f32(x, w, dy, eps):
    """dx, dw of sum(y * dy) in float32, rounding h to x's dtype as the forward does (straight through)."""
    xf = x.detach().float().requires_grad_(True)
    wf = w.detach().float().requires_grad_(True)
    h = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if x.dtype != torch.float32:
        h = h + (h.to(x.dtype).float() - h).detach()
    y = wf * h
    (y * dy.float()).sum().backward()
    return xf.grad, wf.grad


def make_case(n, d, eps, dtype=torch.float32, w_dtype=None, scale=1.0):
    w_dtype = w_dtype or dtype
    x = (torch.randn(n, d) * scale).to(dtype)
    # Weights near 1 as in a trained model, but not exactly 1 so that w matters.
    w = (1.0 + 0.1 * torch.randn(d)).to(w_dtype)
    dy = torch.randn(n, d).to(dtype)
    arrays = {"x": x, "w": w, "dy": dy, "rstd": rstd_of(x, eps)}
    params = {"N": n, "D": d, "eps": eps, "dtype": str(dtype).replace("torch.", ""),
              "w_dtype": str(w_dtype).replace("torch.", "")}
    if dtype == torch.float32 and w_dtype == torch.float32:
        xg = x.clone().requires_grad_(True)
        wg = w.clone().requires_grad_(True)
        y = llama_rmsnorm(xg, wg, eps)
        (y * dy).sum().backward()
        arrays.update(y=y, dx=xg.grad, dw=wg.grad)
    else:
        y = llama_rmsnorm(x, w, eps)  # HF's output dtype: the promotion of w and h.to(x.dtype)
        dx, dw = grads_f32(x, w, dy, eps)
        arrays.update(y=y, dx=dx, dw=dw)
        xg = x.clone().requires_grad_(True)
        wg = w.clone().requires_grad_(True)
        (llama_rmsnorm(xg, wg, eps) * dy).sum().backward()
        arrays.update(dx_hf=xg.grad, dw_hf=wg.grad)
    return arrays, params


def cases():
    specs = [
        ("n1_d16", 1, 16, 1e-5, {}),
        ("n7_d33", 7, 33, 1e-6, {}),
        ("n64_d256", 64, 256, 1e-5, {}),
        ("n5_d1", 5, 1, 1e-6, {}),
        ("n3_d8_tiny", 3, 8, 1e-6, {"scale": 1e-3}),  # eps is significant next to mean(x^2)
        ("n9_d100_large", 9, 100, 1e-5, {"scale": 50.0}),
        ("bf16_n13_d96", 13, 96, 1e-5, {"dtype": torch.bfloat16}),
        ("bf16x_f32w_n4_d40", 4, 40, 1e-6, {"dtype": torch.bfloat16, "w_dtype": torch.float32}),
    ]
    for name, n, d, eps, kw in specs:
        arrays, params = make_case(n, d, eps, **kw)
        yield name, arrays, params
