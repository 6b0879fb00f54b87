(* Dense row-major float matrices in one flat array, with accessor helpers. *)
type t = { rows : int; cols : int; data : float array }

let create rows cols = { rows; cols; data = Array.make (rows * cols) 0. }
let init rows cols f = { rows; cols; data = Array.init (rows * cols) (fun k -> f (k / cols) (k mod cols)) }
let get m i j = Array.unsafe_get m.data ((i * m.cols) + j)
let set m i j v = Array.unsafe_set m.data ((i * m.cols) + j) v
let update m i j f = set m i j (f (get m i j))
let copy m = { m with data = Array.copy m.data }

let swap_rows m a b =
  if a <> b then
    for j = 0 to m.cols - 1 do
      let t = get m a j in
      set m a j (get m b j);
      set m b j t
    done

let mul_vec m v = Array.init m.rows (fun i -> let s = ref 0. in for j = 0 to m.cols - 1 do s := !s +. (get m i j *. v.(j)) done; !s)
