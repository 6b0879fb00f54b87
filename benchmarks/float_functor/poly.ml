(* Dense univariate polynomials over any field (coefficients lowest degree first). *)

module Make (F : Field.S) = struct
  type t = F.t array

  let degree p =
    let d = ref (Array.length p - 1) in
    while !d >= 0 && F.equal p.(!d) F.zero do decr d done;
    !d

  let trim p = Array.sub p 0 (degree p + 1)
  let const c = [| c |]
  let x = [| F.zero; F.one |]
  let coeff p i = if i < Array.length p then p.(i) else F.zero

  let map2 f p q =
    let n = max (Array.length p) (Array.length q) in
    Array.init n (fun i -> f (coeff p i) (coeff q i))

  let add = map2 F.add
  let sub = map2 F.sub
  let scale c p = Array.map (F.mul c) p

  let mul p q =
    if Array.length p = 0 || Array.length q = 0 then [||]
    else begin
      let r = Array.make (Array.length p + Array.length q - 1) F.zero in
      Array.iteri (fun i a -> Array.iteri (fun j b -> r.(i + j) <- F.add r.(i + j) (F.mul a b)) q) p;
      r
    end

  let eval p v =
    let acc = ref F.zero in
    for i = Array.length p - 1 downto 0 do
      acc := F.add (F.mul !acc v) p.(i)
    done;
    !acc

  let deriv p =
    if Array.length p <= 1 then [||] else Array.init (Array.length p - 1) (fun i -> F.mul (F.of_int (i + 1)) p.(i + 1))

  (* Newton iteration on p from x0 *)
  let newton_root p x0 iters =
    let dp = deriv p in
    let rec go x k =
      if k = 0 then x
      else
        let d = eval dp x in
        if F.equal d F.zero then x else go (F.sub x (F.div (eval p x) d)) (k - 1)
    in
    go x0 iters
end
