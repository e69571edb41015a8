# Welch-Satterthwaite intervals of the best val loss between the arms of this directory (no scipy on the
# machine: the t CDF by Simpson integration). `fp4lab compare` groups runs by recipe and tests the final
# val_loss, so it cannot split these arms (same recipe) nor test `best`. Run: python3 best_val_welch.py (here).
import json,glob,statistics as st,math
def tpdf(x,df): return math.exp(math.lgamma((df+1)/2)-math.lgamma(df/2))/math.sqrt(df*math.pi)*(1+x*x/df)**(-(df+1)/2)
def tcdf(x,df,n=20000):
    # integral from 0 to |x| by Simpson
    a,b=0.0,abs(x); h=(b-a)/n; s=tpdf(a,df)+tpdf(b,df)
    for i in range(1,n): s+=(4 if i%2 else 2)*tpdf(a+i*h,df)
    v=s*h/3; return 0.5+v if x>=0 else 0.5-v
def tq(p,df):
    lo,hi=0.0,100.0
    for _ in range(100):
        m=(lo+hi)/2
        if tcdf(m,df,2000)<p: lo=m
        else: hi=m
    return (lo+hi)/2
def best(d): return [json.load(open(f))['best'] for f in sorted(glob.glob(d+'/*/summary.json'))]
g={k:best(k) for k in ['runs_fp32','runs_bf16','runs_fp32attn','runs_gpt2_fp32','runs_gpt2_bf16']}
for k,v in g.items(): print('%-16s'%k, ' '.join('%.5f'%x for x in v), ' mean %.5f  sd %.5f'%(st.mean(v), st.stdev(v)))
def welch(a,b):
    ma,mb=st.mean(a),st.mean(b); va,vb=st.variance(a)/len(a),st.variance(b)/len(b)
    se=(va+vb)**.5; df=(va+vb)**2/(va**2/(len(a)-1)+vb**2/(len(b)-1)); t=tq(.975,df)
    p=2*(1-tcdf(abs(mb-ma)/se,df))
    return mb-ma, mb-ma-t*se, mb-ma+t*se, df, p
for a,b in [('runs_fp32attn','runs_fp32'),('runs_fp32','runs_bf16'),('runs_gpt2_fp32','runs_gpt2_bf16')]:
    d,lo,hi,df,p=welch(g[a],g[b]); print('%s -> %s: diff %+.5f  95%% CI [%+.5f, %+.5f]  Welch df %.1f  p %.2f'%(a,b,d,lo,hi,df,p))
